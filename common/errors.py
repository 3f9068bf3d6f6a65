"""Errors a user can hit, each saying how to fix it. Only the CLI turns them
into exit codes."""


class JitterscopeError(Exception):
    """Base class: the message is one line a user can act on."""

    exit_code = 1


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


class UnsafeQuery(JitterscopeError):
    """User SQL that could do more than read the store."""

    exit_code = 65  # EX_DATAERR


class NoData(JitterscopeError):
    """The store has no jitterscope database yet (nothing was collected)."""

    exit_code = 66  # EX_NOINPUT
