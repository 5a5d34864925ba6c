"""The learner: trains the policy on verified rollouts and publishes new versions."""
