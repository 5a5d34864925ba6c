"""The way through home routers: every process's libp2p host and DHT.

The host factory with our security settings (``host``: Noise only, the
connection gate and limits of ``conngate`` and ``connlimits``, the
identify answer of ``identify``), joining the
swarm (``swarm``, DHT bounds in ``dht_limits``, record validation in
``records``), reaching a peer behind NAT (``dial``, circuit relay v2 in
``relay`` and ``relay_server``, AutoNAT in ``reachability``, the doctor's
probes in ``probe``, port forwarding in ``upnp``, mDNS in ``lan``).

May import the language (the modules directly under ``protocol``) and
``protocol.process``; not ``wire``, ``broadcast`` or ``models``, which build
on it. Imported by every role.
"""
