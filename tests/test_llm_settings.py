"""The [llm] configuration, the model table, the observer archetype, cost, backend choice."""

from __future__ import annotations

import re

import pytest

from opencortex.config import ConfigError, load_config
from opencortex.events import Thread
from opencortex.llm import (EchoBackend, EchoFallback, Usage, archetype_for, choose_model,
                            estimate_cost, make_backend)
from opencortex.llm.anthropic_api import AnthropicBackend
from opencortex.llm.cost import price_for
from opencortex.llm.openai_compatible import OpenAICompatibleBackend
from opencortex.llm.settings import LLMSettings, Price

TABLE = """
backend = "anthropic"

[llm]
max_tokens = 2000
temperature = 0.5
stall_timeout = 5

[llm.anthropic]
model = "claude-sonnet-4-6"

[[llm.models]]
archetype = "developer"
model = "big"

[[llm.models]]
archetype = "guest"
model = "small"
max_tokens = 300

[[llm.models]]
archetype = "guest"
channel = "telegram"
skill = "chat"
model = "tiny"
temperature = 0.1

[[llm.models]]
archetype = "citizen"
backend = "openai"
model = "local"

[llm.owners]
"telegram:12345" = "developer"
"matrix:*" = "citizen"
"signal:+4900" = "friend"

[llm.prices]
"big" = { input = 10, output = 50 }
"""


def settings_from(home, text: str) -> LLMSettings:
    (home / "config.toml").write_text(text)
    return load_config(home).llm


def test_the_llm_table_is_read_from_toml(home):
    (home / "config.toml").write_text(TABLE)
    config = load_config(home)
    llm = config.llm
    assert config.backend == "anthropic"
    assert (llm.max_tokens, llm.temperature, llm.stall_timeout) == (2000, 0.5, 5)
    assert llm.anthropic.model == "claude-sonnet-4-6"
    assert [row.model for row in llm.models] == ["big", "small", "tiny", "local"]
    assert llm.owners["telegram:12345"] == "developer"
    assert llm.prices["big"].output == 50
    assert "claude-haiku-4-5" in llm.prices  # the file's prices extend the built-in ones


@pytest.mark.parametrize("text, fragment", [
    ("[llm]\nmax_tokens = 0\n", "llm.max_tokens"),
    ("[llm]\nbogus = 1\n", "llm.bogus"),
    ("[[llm.models]]\nmodel = 'x'\nmax_token = 5\n", "llm.models[0].max_token"),
    ("[llm.owners]\n\"12345\" = \"developer\"\n", "CHANNEL:CHAT-ID"),
    ("[llm.prices]\nx = { input = -1, output = 1 }\n", "llm.prices.x.input"),
    ("backend = \"claude\"\n", "backend"),
])
def test_a_wrong_llm_table_is_named(home, text, fragment):
    (home / "config.toml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_config(home)


@pytest.mark.parametrize("thread, archetype", [
    (Thread("cli", "local"), "developer"),
    (Thread("emacs", "main"), "developer"),
    (Thread("telegram", "999"), "guest"),
    (Thread("telegram", "12345"), "developer"),
    (Thread("matrix", "!room:example.org"), "citizen"),
    (Thread("signal", "+4900"), "friend"),
])
def test_the_observer_archetype_of_a_thread(home, thread, archetype):
    assert archetype_for(thread, settings_from(home, TABLE)) == archetype


def test_owners_can_demote_a_local_channel():
    settings = LLMSettings(owners={"cli:*": "guest"})
    assert archetype_for(Thread("cli", "local"), settings) == "guest"


def test_the_most_specific_row_wins_and_gaps_fall_back(home):
    llm = settings_from(home, TABLE)

    def pick(backend="anthropic", **routing):
        choice = choose_model(llm, backend, llm.anthropic.model, routing)
        return choice.model, choice.max_tokens, choice.temperature

    assert pick(archetype="developer") == ("big", 2000, 0.5)
    assert pick(archetype="guest", channel="signal") == ("small", 300, 0.5)
    assert pick(archetype="guest", channel="telegram", skill="chat") == ("tiny", 2000, 0.1)
    assert pick(archetype="guest", channel="telegram", skill="other") == ("small", 300, 0.5)
    assert pick(archetype="citizen") == ("claude-sonnet-4-6", 2000, 0.5)  # row is openai's
    assert pick("openai", archetype="citizen") == ("local", 2000, 0.5)
    assert pick(archetype="friend") == ("claude-sonnet-4-6", 2000, 0.5)  # no row: defaults


def test_model_override_beats_the_table_but_keeps_the_caps(home):
    llm = settings_from(home, TABLE).model_copy(update={"model": "forced"})
    choice = choose_model(llm, "anthropic", "default", {"archetype": "guest"})
    assert (choice.model, choice.max_tokens) == ("forced", 300)


def test_documented_defaults_owner_large_guest_small():
    llm = LLMSettings()
    owner = choose_model(llm, "anthropic", llm.anthropic.model, {"archetype": "developer"})
    guest = choose_model(llm, "anthropic", llm.anthropic.model, {"archetype": "guest"})
    local_guest = choose_model(llm, "openai", "llama3", {"archetype": "guest"})
    citizen = choose_model(llm, "anthropic", llm.anthropic.model, {"archetype": "citizen"})
    assert owner.model == "claude-opus-4-7" and owner.max_tokens == 4096
    assert guest.model == "claude-haiku-4-5" and guest.max_tokens == 1024
    assert local_guest.model == "llama3" and local_guest.max_tokens == 1024
    assert citizen.model == "claude-sonnet-4-6"


def test_cost_from_the_price_table():
    prices = {"m": Price(input=3, output=15), "m-cached": Price(input=3, output=15,
                                                                cache_read=1, cache_write=2)}
    usage = Usage(input_tokens=1_000_000, output_tokens=100_000, model="m")
    assert estimate_cost(usage, prices) == pytest.approx(3 + 1.5)
    cached = Usage(input_tokens=1_000_000, cache_read_tokens=500_000, cache_write_tokens=100_000,
                   output_tokens=0, model="m")
    assert estimate_cost(cached, prices) == pytest.approx(0.4 * 3 + 0.5 * 0.3 + 0.1 * 3.75)
    dated = Usage(input_tokens=10, model="m-cached-2026")
    assert price_for("m-cached-2026", prices) is prices["m-cached"]  # longest prefix
    assert estimate_cost(dated, prices) == pytest.approx(10 * 3 / 1e6)
    assert estimate_cost(Usage(input_tokens=5, model="unknown"), prices) is None


@pytest.fixture
def no_provider_env(monkeypatch):
    for name in ("ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def test_auto_without_keys_is_echo_with_a_warning(config, no_provider_env):
    backend = make_backend(config)
    assert isinstance(backend, EchoBackend)
    assert "ANTHROPIC_API_KEY" in backend.warning and "echo mode" in backend.warning


def test_auto_picks_the_provider_whose_key_is_set(home, monkeypatch, no_provider_env):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-SECRET")
    backend = make_backend(load_config(home))
    assert isinstance(backend, EchoFallback) and isinstance(backend.primary, AnthropicBackend)
    assert backend.name == "anthropic" and backend.warning is None
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-SECRET")
    backend = make_backend(load_config(home))
    assert isinstance(backend.primary, OpenAICompatibleBackend)


def test_auto_picks_a_configured_local_server(home, no_provider_env):
    (home / "config.toml").write_text('[llm.openai]\nbase_url = "http://127.0.0.1:9/v1"\n'
                                      'model = "llama3"\n')
    backend = make_backend(load_config(home))
    assert backend.name == "openai" and not backend.primary.key_missing


def test_a_missing_key_is_named_at_start(home, no_provider_env):
    backend = make_backend(load_config(home, backend="anthropic"))
    assert isinstance(backend, EchoFallback)
    assert "ANTHROPIC_API_KEY is not set" in backend.warning
    official = make_backend(load_config(home, backend="openai"))
    assert "OPENAI_API_KEY is not set" in official.warning


def test_fallback_can_be_switched_off(home, monkeypatch, no_provider_env):
    (home / "config.toml").write_text("[llm]\nfallback_to_echo = false\n")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-SECRET")
    assert isinstance(make_backend(load_config(home, backend="anthropic")), AnthropicBackend)


def test_provider_addresses_come_from_config_then_environment(home, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:2/v1")
    llm = load_config(home).llm
    assert AnthropicBackend(llm).provider.base_url == "http://127.0.0.1:1"
    assert OpenAICompatibleBackend(llm).provider.base_url == "http://127.0.0.1:2/v1"
    assert not OpenAICompatibleBackend(llm).key_required  # a local server needs no key
    configured = llm.model_copy(update={"anthropic": llm.anthropic.model_copy(
        update={"base_url": "http://127.0.0.1:3"})})
    assert AnthropicBackend(configured).provider.base_url == "http://127.0.0.1:3"
