# SPDX-License-Identifier: Apache-2.0
"""The NVIDIA driver's stand-in for a collector under test (on PYTHONPATH
only there, tests/integration/test_gpu_reports.py): kernel-log records whose
message carries $JITTERSCOPE_TEST_DRIVER_MARK are read as the kernel's
(facility 0), as the driver's printk is. A test writes its Xid lines into
/dev/kmsg from user space, which the kernel gives facility user, and the
xid probe takes only the kernel's (collector/probes/xid.py): without a GPU
there is no other way to put a driver's line in the log. Lines without the
mark are read as they are."""

import os

_MARK = os.environ.get("JITTERSCOPE_TEST_DRIVER_MARK", "").encode()

if _MARK:
    from jitterscope.collector import kmsg

    _parse = kmsg.parse_record

    def _as_the_driver(data: bytes):
        record = _parse(data)
        if record is not None and _MARK in record.message.encode():
            record = record._replace(priority=record.priority & 7)
        return record

    kmsg.parse_record = _as_the_driver
