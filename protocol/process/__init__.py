"""What every Echo Swarm process needs that is no protocol at all.

Typed configuration from flags, environment and TOML (``config``),
structured quiet logs (``logs``), progress bars and tables for the command
line (``progress``, ``tables``), running a daemon under trio until Ctrl-C
(``runtime``), files never seen half-written (``files``), and keeping
glibc's allocator from hoarding memory (``malloc``).

Imports no other first-party module, so that anything may import it: it
lives under ``protocol`` because node, learner and bootstrap must share one
copy and never import each other.
"""
