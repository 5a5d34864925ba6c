"""The bootstrap peer: the swarm's entry point, a Kademlia DHT server."""
