"""The volunteer node: fetches weights, generates rollouts, signs and submits them."""
