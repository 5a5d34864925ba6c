"""What a node will not do, and why: the errors every check of the node raises."""


class Refused(ValueError):
    """An assignment this node will not run; the message says why."""


class DoesNotFit(Refused):
    """A sound job whose model this machine cannot hold (memory, device)."""
