# SPDX-License-Identifier: Apache-2.0
"""DeviceOpens: the GPU fd rescan runs only after a device file was opened,
closed or created (inotify on a real directory), and at the backstop."""

from jitterscope.collector.device_watch import DeviceOpens, _directory_of


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_rescans_only_after_an_open_close_or_a_new_device(tmp_path):
    clock = Clock()
    opens = DeviceOpens([str(tmp_path / "gpu[0-9]*")], backstop_s=60, clock=clock)
    assert opens.watching
    assert opens.due()  # the first look
    assert not opens.due()  # nothing happened
    (tmp_path / "other").write_text("x")  # not a device: its directory's create still says "look"
    opens.due()
    (tmp_path / "gpu0").write_text("")  # a device appears
    assert opens.due()
    assert not opens.due()
    (tmp_path / "other").read_text()  # an open of a file that is no device
    assert not opens.due()
    with open(tmp_path / "gpu0"):  # a process opens the device ...
        assert opens.due()
    assert opens.due()  # ... and closes it
    assert not opens.due()
    clock.now += 61  # the backstop, now that a device exists
    assert opens.due()
    opens.close()
    assert opens.due()  # no inotify: every rescan looks, nothing is missed


def test_no_device_file_means_no_scan_after_the_first(tmp_path):
    clock = Clock()
    opens = DeviceOpens([str(tmp_path / "nvidia[0-9]*")], backstop_s=60, clock=clock)
    assert opens.due()
    clock.now += 3600
    assert not opens.due()  # no GPU on this host: no backstop scans either
    opens.close()


def test_directory_of_a_pattern():
    assert _directory_of("/dev/nvidia[0-9]*") == "/dev"
    assert _directory_of("/dev/dri/render*") == "/dev/dri"
    assert _directory_of("/dev/*/card0") == "/dev"
    assert _directory_of("gpu*") == "/"
