import pytest

from opencortex.config import ConfigError, load_config


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("OPENCORTEX_HOME", "OPENCORTEX_CONFIG", "OPENCORTEX_BACKEND", "OPENCORTEX_MODEL",
                 "OPENCORTEX_SCRIPT", "OPENCORTEX_SKILL_DIRS", "OPENCORTEX_PERSONA"):
        monkeypatch.delenv(name, raising=False)


def test_defaults_follow_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    config = load_config()
    assert config.home == (tmp_path / "data" / "opencortex").resolve()
    assert config.memory_dir == config.home / "memory"
    assert config.backend == "auto"
    assert config.config_file is None


def test_toml_file_in_home_and_relative_paths(tmp_path):
    (tmp_path / "config.toml").write_text(
        'backend = "script"\nscript = "replies.txt"\nskill_dirs = ["mine"]\n'
        'max_rejections = 2\n[chat]\nallowed_buffers = ["*notes*"]\n')
    config = load_config(tmp_path)
    assert config.backend == "script"
    assert config.script == tmp_path / "replies.txt"
    assert config.skill_dirs == [tmp_path / "mine"]
    assert config.max_rejections == 2
    assert config.chat.allowed_buffers == ["*notes*"]
    assert config.all_skill_dirs[-1] == tmp_path / "mine"


def test_environment_beats_file_and_arguments_beat_environment(tmp_path, monkeypatch):
    (tmp_path / "config.toml").write_text('backend = "script"\nscript = "x"\n')
    monkeypatch.setenv("OPENCORTEX_BACKEND", "echo")
    assert load_config(tmp_path).backend == "echo"
    assert load_config(tmp_path, backend="script").backend == "script"


@pytest.mark.parametrize("content, fragment", [
    ("backend = [", "not valid TOML"),
    ('backend = "gpt"', "backend must be one of 'auto', 'echo', 'script', 'anthropic' or "
                        "'openai', not 'gpt'"),
    ("max_rejections = -1", "max_rejections must be at least 0, not -1"),
    ("unknown_key = 1", "unknown setting unknown_key; check its spelling"),
    ("skill_dirs = 5", "skill_dirs must be a list, not int (5)"),
    ('skill_dirs = ["ok", 5]', "skill_dirs[1] must be a path, not int (5)"),
    ("persona = true", "persona must be a path, not bool (True)"),
    ("chat = 3", "chat must be a table, not int (3)"),
    ('[chat]\nhistory_chars = "lots"', "chat.history_chars must be a whole number, "
                                       "not str ('lots')"),
])
def test_bad_configuration_is_named(tmp_path, content, fragment):
    (tmp_path / "config.toml").write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert fragment in str(caught.value)
    assert "config.toml" in str(caught.value)
    assert "Input should" not in str(caught.value) and "errors.pydantic" not in str(caught.value)


def test_a_directory_or_a_file_that_is_not_utf8_is_named(tmp_path, monkeypatch):
    (tmp_path / "config.toml").mkdir()
    with pytest.raises(ConfigError, match="config.toml is a directory, not a configuration"):
        load_config(tmp_path)
    other = tmp_path / "latin1.toml"
    other.write_bytes('persona = "caf\xe9"\n'.encode("latin-1"))
    monkeypatch.setenv("OPENCORTEX_CONFIG", str(other))
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert str(caught.value) == (f"{other}: not UTF-8 text (byte 0xe9 at offset 14); "
                                 "save it as UTF-8")


def test_a_missing_file_means_the_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENCORTEX_CONFIG", str(tmp_path / "absent.toml"))
    assert load_config(tmp_path).config_file is None


def test_model_from_the_environment_keeps_the_rest_of_the_llm_table(tmp_path, monkeypatch):
    (tmp_path / "config.toml").write_text('[llm]\nmodel = "from-file"\nmax_tokens = 321\n')
    assert load_config(tmp_path).llm.model == "from-file"
    monkeypatch.setenv("OPENCORTEX_MODEL", "from-env")
    config = load_config(tmp_path)
    assert config.llm.model == "from-env" and config.llm.max_tokens == 321
