import platform

from probe.core.allocator import ENV, tune_allocator


def test_thresholds_are_set_under_glibc(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    assert tune_allocator() is (platform.libc_ver()[0] == "glibc")


def test_a_threshold_the_user_set_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000")
    assert tune_allocator() is False
