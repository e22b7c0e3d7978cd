"""Errors that reach the user as one line on stderr.

Library code raises these; the command line turns them into
``speechstream: error: <message>`` and the exit code below.
"""


class SpeechstreamError(Exception):
    """A failure the user should read about in one line (exit code 1)."""

    exit_code = 1


class InputError(SpeechstreamError):
    """Bad usage or bad input: a missing file, unreadable audio, a wrong option (exit code 2)."""

    exit_code = 2
