from pyspark_abs.protocol.compaction import CompactionPolicy


def test_every_n_epochs() -> None:
    policy = CompactionPolicy(every_epochs=3, ratio=0)
    assert [policy.observe(10, 100) for _ in range(7)] == [
        False,
        False,
        True,
        False,
        False,
        True,
        False,
    ]


def test_changelog_ratio() -> None:
    policy = CompactionPolicy(every_epochs=0, ratio=2.0)
    assert not policy.observe(50, 100)  # 150 rows for 100 keys
    assert policy.observe(60, 100)  # 210 rows for 100 keys
    assert not policy.observe(10, 100)  # counting starts again


def test_off() -> None:
    policy = CompactionPolicy(every_epochs=0, ratio=0)
    assert not any(policy.observe(1_000, 1) for _ in range(10))
