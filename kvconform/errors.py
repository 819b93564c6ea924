"""The one error type of bad input.

Something a user gave — an option, a results or expectations file, a descriptor, a bundle —
cannot be used. The message names it (the option or the file) and says what was expected.
Every input validator raises :class:`InputError` (or a subclass naming the kind of input); the
pytest plugin turns it into a usage error (exit 4) in one place, the commands into exit 2.
"""


class InputError(ValueError):
    """Bad input; the message names the option or file and what was expected."""
