# Copyright (c) gpuops.gpu contributors
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import pytest

from ansible_collections.gpuops.gpu.plugins.module_utils import _validate
from ansible_collections.gpuops.gpu.plugins.module_utils._host import procs as _procs
from ansible_collections.gpuops.gpu.plugins.module_utils._redact import (
    MASK,
    MAX_SHOWN,
    cut,
    is_secret_option,
    match_text,
    redact_argv,
    redact_text,
)

SK = "sk-proj0123456789abcdefXYZ"
HF = "hf_AbCdEfGhIjKlMnOpQrStUv123"

# (name, argv, expected shown text)
ARGV_CASES = [
    ("nothing secret", ["python3", "-m", "sglang.launch_server", "--port", "30000"],
     "python3 -m sglang.launch_server --port 30000"),
    ("--api-key value", ["vllm", "serve", "m", "--api-key", SK], "vllm serve m --api-key ****"),
    ("--api-key=value", ["vllm", "serve", "--api-key=secret123"], "vllm serve --api-key=****"),
    ("--api_key value", ["srv", "--api_key", "abc"], "srv --api_key ****"),
    ("--token", ["srv", "--token", "abc"], "srv --token ****"),
    ("--hf-token", ["srv", "--hf-token", "abc"], "srv --hf-token ****"),
    ("--hf-token=", ["srv", "--hf-token=abc"], "srv --hf-token=****"),
    ("--password", ["srv", "--password", "hunter2"], "srv --password ****"),
    ("--secret", ["srv", "--secret", "x"], "srv --secret ****"),
    ("--secret-key=", ["srv", "--secret-key=x"], "srv --secret-key=****"),
    ("--secrets-file", ["srv", "--secrets-file", "/run/s"], "srv --secrets-file ****"),
    ("prefixed option", ["srv", "--openai-api-key", "x", "--db-password=y"], "srv --openai-api-key **** --db-password=****"),
    ("option case", ["srv", "--API-KEY", "x"], "srv --API-KEY ****"),
    ("value with spaces is one word", ["srv", "--api-key", "a b c"], "srv --api-key ****"),
    ("a flag-like next word is not a value", ["srv", "--token", "--port", "1"], "srv --token --port 1"),
    ("last word", ["srv", "--api-key"], "srv --api-key"),
    ("empty value", ["srv", "--api-key="], "srv --api-key="),
    ("not secret: --max-tokens", ["srv", "--max-tokens", "512"], "srv --max-tokens 512"),
    ("not secret: --max-num-batched-tokens", ["srv", "--max-num-batched-tokens=8192"], "srv --max-num-batched-tokens=8192"),
    ("not secret: --tokenizer", ["srv", "--tokenizer", "meta/llama"], "srv --tokenizer meta/llama"),
    ("not secret: --ssl-keyfile", ["srv", "--ssl-keyfile", "/k.pem"], "srv --ssl-keyfile /k.pem"),
    ("HF_TOKEN=", ["env", f"HF_TOKEN={HF}", "python3"], "env HF_TOKEN=**** python3"),
    ("OPENAI_API_KEY=", ["env", "OPENAI_API_KEY=abc"], "env OPENAI_API_KEY=****"),
    ("AWS_SECRET_ACCESS_KEY=", ["env", "AWS_SECRET_ACCESS_KEY=abc"], "env AWS_SECRET_ACCESS_KEY=****"),
    ("DB_PASSWORD=", ["env", "DB_PASSWORD=abc"], "env DB_PASSWORD=****"),
    ("APP_SECRET=", ["env", "APP_SECRET=abc"], "env APP_SECRET=****"),
    ("TOKEN=", ["env", "TOKEN=abc"], "env TOKEN=****"),
    # An unquoted value runs to the next blank: better hide a ')' too than show the end of a secret.
    ("lower case hf_token=", ["python3", "-c", "login(hf_token=abc)"], "python3 -c login(hf_token=****"),
    ("quoted value", ["sh", "-c", 'HF_TOKEN="a b" python3'], 'sh -c HF_TOKEN=**** python3'),
    ("not secret: TOKENIZERS_PARALLELISM", ["env", "TOKENIZERS_PARALLELISM=false"], "env TOKENIZERS_PARALLELISM=false"),
    ("not secret: monkey=", ["x", "monkey=1"], "x monkey=1"),
    ("bare hf_ token", ["login", HF], "login ****"),
    ("bare sk- token", ["curl", "-H", f"X-Key: {SK}"], "curl -H X-Key: ****"),
    ("Bearer", ["curl", "-H", "Authorization: Bearer abc.def"], "curl -H Authorization: Bearer ****"),
    ("URL password", ["srv", "--db", "postgres://app:pw123@db:5432/x"], "srv --db postgres://app:****@db:5432/x"),
    ("URL without password", ["srv", "--url", "https://host:8080/v1"], "srv --url https://host:8080/v1"),
    ("short hf_ word is no token", ["srv", "--use-hf_transfer"], "srv --use-hf_transfer"),
    ("sk- inside a word is no token", ["srv", "--task-sk-learn-0123456789abcdefgh"], "srv --task-sk-learn-0123456789abcdefgh"),
    ("a shell line in one word", ["bash", "-c", f"exec vllm serve --api-key {SK} --port 8000"],
     "bash -c exec vllm serve --api-key **** --port 8000"),
    ("a shell line with --opt=", ["bash", "-c", "vllm --hf-token=abc serve"], "bash -c vllm --hf-token=**** serve"),
    ("the simulator's argv", ["python3", "-", "-m", "vllm", "--api-key", SK, f"HF_TOKEN={HF}"],
     "python3 - -m vllm --api-key **** HF_TOKEN=****"),
    ("empty", [], ""),
]


@pytest.mark.parametrize("name, argv, expected", ARGV_CASES, ids=[c[0] for c in ARGV_CASES])
def test_redact_argv(name, argv, expected):
    assert redact_argv(argv) == expected


@pytest.mark.parametrize("word, expected", [
    ("--api-key", True), ("--token", True), ("--hf-token", True), ("--password", True), ("--secret", True),
    ("--secret-anything", True), ("--openai-api-key", True), ("--hf_token", True),
    ("--api-key=x", False), ("--max-tokens", False), ("--tokenizer", False), ("--key", False), ("-t", False),
    ("api-key", False),
])
def test_is_secret_option(word, expected):
    assert is_secret_option(word) is expected


# (name, extra patterns, argv, expected)
EXTRA_CASES = [
    ("whole match", [r"corp-[0-9]+"], ["srv", "--tenant", "corp-1234"], "srv --tenant ****"),
    ("group only", [r"--license (\S+)"], ["srv", "--license", "ABC-DEF", "--port", "1"], "srv --license **** --port 1"),
    ("two groups", [r"(u\w+):(p\w+)"], ["x", "user1:pass1"], "x ****:****"),
    ("patterns apply in turn", [r"abc", r"bcd"], ["x", "abcde"], "x ****de"),
    ("nested groups", [r"((a)b)"], ["x", "abz"], "x ****z"),
    ("no match", [r"nothing"], ["x", "y"], "x y"),
    ("built-in first", [r"\*\*\*\*"], ["x", "--token", "t"], "x --token ****"),
]


@pytest.mark.parametrize("name, patterns, argv, expected", EXTRA_CASES, ids=[c[0] for c in EXTRA_CASES])
def test_extra_patterns(name, patterns, argv, expected):
    assert redact_argv(argv, _validate.regexes("redact", patterns)) == expected


def test_long_command_lines_are_cut_with_a_marker():
    argv = ["python3"] + ["--flag"] * 400
    text = redact_argv(argv)
    full = " ".join(argv)
    assert text.startswith(full[:MAX_SHOWN]) and len(full) > MAX_SHOWN
    assert text.endswith(f" [... {len(full) - MAX_SHOWN} more characters cut]")
    assert cut("short") == "short"


def test_a_secret_beyond_the_cut_is_masked_before_cutting():
    # The secret straddles the cut: it is masked on the whole text first, so no part of it is shown.
    argv = ["x" * (MAX_SHOWN - 12), "--api-key", SK]
    assert "sk-proj" not in redact_argv(argv)
    argv = ["x" * (MAX_SHOWN - 5), SK]
    assert "sk-p" not in redact_argv(argv)


def test_match_text_is_the_raw_text_cut_at_4096():
    argv = ["srv", "--api-key", SK] + ["y" * 100] * 60
    assert match_text(argv).startswith(f"srv --api-key {SK} ")
    assert len(match_text(argv)) == _validate.MATCH_CHARS


def test_redact_text():
    assert redact_text(f"vllm --api-key {SK}") == "vllm --api-key ****"
    assert redact_text("") == ""
    assert redact_text(None) is None


def test_read_process_redacts_by_default(tmp_path):
    pid = 4242
    d = tmp_path / str(pid)
    d.mkdir()
    (d / "stat").write_text(f"{pid} (python3) S 1 {pid} {pid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0 0\n")
    (d / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\nNSpid:\t4242\n")
    (d / "cmdline").write_bytes(b"\0".join([b"vllm", b"--api-key", SK.encode(), f"HF_TOKEN={HF}".encode()]) + b"\0")
    (d / "cgroup").write_text("0::/\n")
    info = _procs.read_process(pid, proc=str(tmp_path))
    assert info["cmdline"] == "vllm --api-key **** HF_TOKEN=****"
    assert SK not in repr(info) and HF not in repr(info)
    raw = _procs.read_process(pid, proc=str(tmp_path), cmdline=match_text)
    assert SK in raw["cmdline"]
    assert MASK == "****"
