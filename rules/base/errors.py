"""SpecError, apart from the spec machinery (rules/declare/spec_model.py) so that a run that never loads a spec never
imports it."""


class SpecError(ValueError):
    """A spec that cannot be built; the message says where, what was received and what is allowed."""
