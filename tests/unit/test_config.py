from pathlib import Path

import pytest

from pyspark_abs import AbsConfig
from pyspark_abs.config import spark_conf_key
from pyspark_abs.errors import ConfigError
from pyspark_abs.pipeline.connect import require_supported


def test_defaults() -> None:
    config = AbsConfig()
    assert config.commit_mode == "async"
    assert config.key_groups == 256
    assert config.snapshots is True
    assert config.snapshot_interval == 1


def test_from_mapping_converts_strings() -> None:
    config = AbsConfig.from_mapping(
        {
            "commit_mode": "sync",
            "key_groups": "64",
            "snapshots": "false",
            "max_key_group_state_bytes": "1048576",
        }
    )
    assert config == AbsConfig(
        commit_mode="sync", key_groups=64, snapshots=False, max_key_group_state_bytes=1048576
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"commit_mod": "sync"}, r"unknown configuration key\(s\) \['commit_mod'\]"),
        ({"commit_mode": "eventually"}, "commit_mode must be 'sync' or 'async'"),
        ({"key_groups": "0"}, "key_groups must be a positive integer"),
        ({"key_groups": "many"}, "cannot read 'many' as int"),
        ({"snapshots": "maybe"}, "cannot read 'maybe' as bool"),
        ({"max_pending_epochs": -1}, "max_pending_epochs must be a positive integer"),
        ({"max_key_group_state_bytes": "0"}, "max_key_group_state_bytes must be a positive"),
        ({"snapshot_interval": "0"}, "snapshot_interval must be a positive integer, got 0"),
        ({"snapshot_interval": "often"}, "snapshot_interval: cannot read 'often' as int"),
        ({"local_state_dir": "state"}, "local_state_dir must be an absolute path .* got 'state'"),
        ({"local_state_dir": "s3://b/x"}, "local_state_dir must be an absolute path"),
        ({"local_state_change_share": "-0.5"}, r"local_state_change_share must be a number >= 0"),
        ({"local_state_change_share": "some"}, "cannot read 'some' as float"),
        ({"snapshot_interval": True}, "snapshot_interval must be a positive integer, got True"),
        (
            {"snapshot_interval": "3", "snapshots": "false"},
            r"snapshot_interval=3 groups the commits of snapshots, but snapshots=False .*; set "
            r"snapshot_interval=1 or snapshots=True",
        ),
    ],
)
def test_bad_values_are_refused(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AbsConfig.from_mapping(values)


CONF = Path(__file__).parents[2] / "conf"


def test_the_example_pipeline_file_is_read() -> None:
    config = AbsConfig.from_file(CONF / "pipeline.toml")
    assert config == AbsConfig(commit_mode="async", key_groups=256, compaction_ratio=10.0)
    assert config.max_key_group_state_bytes == 256 * 1024 * 1024


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[abs]\ncommit_mod = "sync"\n',
            r"in \[abs\] of .*unknown configuration key\(s\) \['commit_mod'\] "
            r"\(did you mean \['commit_mode'\]\?\)",
        ),
        ("[abs]\nkey_groups = 0\n", "key_groups must be a positive integer"),
        ('[job]\nroot = "/data"\n', r"has no \[abs\] table"),
        ("[abs\n", "is not valid TOML"),
    ],
)
def test_bad_files_are_refused(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        AbsConfig.from_file(path)


def test_snapshot_interval_comes_from_code_files_and_strings(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.toml"
    path.write_text("[abs]\nsnapshot_interval = 5\n")
    assert AbsConfig.from_file(path).snapshot_interval == 5
    assert AbsConfig.from_mapping({"snapshot_interval": "10"}) == AbsConfig(snapshot_interval=10)
    assert AbsConfig(snapshot_interval=1, snapshots=False).snapshot_interval == 1


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read configuration file .*nope\.toml"):
        AbsConfig.from_file(tmp_path / "nope.toml")


def test_spark_connect_refuses_a_snapshot_interval() -> None:
    require_supported("wc", AbsConfig(commit_mode="sync"), stops_when_idle=False)
    with pytest.raises(
        ConfigError,
        match=r"pipeline 'wc': under Spark Connect.* cannot commit the last open group of "
        r"snapshot_interval=3 epochs when the query stops; set AbsConfig\(snapshot_interval=1\)",
    ):
        require_supported(
            "wc", AbsConfig(commit_mode="sync", snapshot_interval=3), stops_when_idle=False
        )


def test_a_misspelt_keyword_gets_the_known_keys() -> None:
    with pytest.raises(
        ConfigError,
        match=r"unknown configuration key\(s\) \['key_group'\] \(did you mean \['key_groups'\]\?\)"
        r"; known keys are \['commit_mode', ",
    ):
        AbsConfig(key_group=16)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"\['nonsense'\]; known keys"):
        AbsConfig(commit_mode="sync", nonsense=1)  # type: ignore[call-arg]


def test_each_field_has_the_spark_conf_key_a_session_sets_it_with() -> None:
    assert spark_conf_key("key_groups") == "spark.abs.keyGroups"
    assert spark_conf_key("local_state_change_share") == "spark.abs.localStateChangeShare"
    assert spark_conf_key("snapshots") == "spark.abs.snapshots"
