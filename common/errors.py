# SPDX-License-Identifier: Apache-2.0
"""Errors a user can hit, each saying how to fix it. Only the CLI turns them
into exit codes."""

from jitterscope.common.masking import mask_text


class JitterscopeError(Exception):
    """Base class: the message is one line a user can act on. It is printed
    and logged, so credentials in it (a URL's password, a token) are masked
    as it is made: ``cannot open ClickHouse (http://default:***@ch:8123)``."""

    exit_code = 1

    def __init__(self, *args):
        super().__init__(*(mask_text(a) if isinstance(a, str) else a for a in args))


class NotPrivileged(JitterscopeError):
    exit_code = 77


class KernelHeadersMissing(JitterscopeError):
    pass


class TracefsMissing(JitterscopeError):
    pass


class BccMissing(JitterscopeError):
    pass


class ProbeLoadFailed(JitterscopeError):
    pass


class BrokerUnavailable(JitterscopeError):
    exit_code = 69


class ClickHouseUnavailable(JitterscopeError):
    exit_code = 69


class BadConfig(JitterscopeError):
    exit_code = 78


class PortTaken(JitterscopeError):
    """A port a listener needs is held by another process (common/ports.py
    says which, and the setting that moves it)."""

    exit_code = 69  # EX_UNAVAILABLE


class UnsafeQuery(JitterscopeError):
    """User SQL that could do more than read the store."""

    exit_code = 65  # EX_DATAERR


class NoData(JitterscopeError):
    """The store has no jitterscope database yet (nothing was collected)."""

    exit_code = 66  # EX_NOINPUT


class UnsafeFile(JitterscopeError, OSError):
    """A file jitterscope would write is not safely its own: another user's,
    a hard link, or not a regular file (common/private.py). An OSError too,
    so a caller's ``except OSError`` ("cannot write X: {exc.strerror}") still
    says why. Built as ``UnsafeFile(errno, sentence, path)``."""

    exit_code = 73  # EX_CANTCREAT

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"
