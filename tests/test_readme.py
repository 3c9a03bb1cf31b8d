"""The README's figures are the tool's own output (issue #28): each trace
length, band and verdict the README states is read out of its text and
compared with what the commands it shows produce, so that the text cannot
drift from the code (it once said 25 steps where the tool printed 27).
Times and speed-ups are measurements of a machine, in notes/performance.md,
and are not checked here."""
import json
import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
TEXT = " ".join(README.split())  # the prose, with its line breaks folded


def run(*args, cwd):
    return subprocess.run([sys.executable, "-c", "from reqmodel.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600)


def figure(pattern: str) -> re.Match:
    m = re.search(pattern, TEXT)
    assert m, f"the README no longer says {pattern!r}: update this test with it"
    return m


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_the_run_section_states_the_default_checks_trace_lengths(explored):
    """'reqmodel check' on the incident: no-foreign-kv-read's counterexample
    on 0.5.19, answered-without-timeout's on 0.5.20 and from 0.5.21."""
    def length(rel, prop):
        trace = explored(rel, "incident").verdicts[prop].trace
        return None if trace is None else len(trace)
    m = figure(r"`no-foreign-kv-read` is violated on 0\.5\.19 with a (\d+)-step counterexample")
    assert _number(m.group(1)) == length("0.5.19", "no-foreign-kv-read")
    for rel in ("0.5.20", "0.5.21", "0.5.22", "0.5.23"):
        assert explored(rel, "incident").verdicts["no-foreign-kv-read"].verdict == "holds"
    m = figure(r"waits for its 300 s waiting timeout \((\d+) steps on 0\.5\.20, (\d+) from "
               r"0\.5\.21\)")
    assert _number(m.group(1)) == length("0.5.20", "answered-without-timeout")
    for rel in ("0.5.21", "0.5.22", "0.5.23"):
        assert _number(m.group(2)) == length(rel, "answered-without-timeout")
    assert explored("0.5.19", "incident").verdicts["answered-without-timeout"].verdict == \
        "holds"


def test_the_audit_section_states_what_the_audit_prints(tmp_path):
    """The README's audit command, run as written: its gates, the band of
    prompts the roles treat differently, the fix's limit, and the length of
    the incident's trace on 0.5.19."""
    block = README.split("## Audit a deployment")[1].split("```sh\n")[1].split("```")[0]
    args = shlex.split(block.replace("\\\n", " "))
    assert args[:2] == ["reqmodel", "audit"]
    args = args[1:]  # audit ARGS...
    k = args.index("--markdown")
    args[k + 1] = str(tmp_path / "audit.md")
    r = run(*args, "--out", "out", "--json", cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # a gate fails
    data = json.loads(r.stdout)
    verdict = {g["gate"]: g["verdict"] for g in data["gates"]}
    m = figure(r"\*\*pool-context (\w+)s\*\* \(prompts of ([\d,]+) to ([\d,]+) tokens are "
               r"rejected by prefill and admitted by decode; the fix is the same "
               r"`--context-length` on both roles, at most ([\d,]+)\)")
    assert verdict["pool-context"] == m.group(1)
    lo, hi, limit = (_number(m.group(i)) for i in (2, 3, 4))
    why = " ".join(f["why"] + " " + (f.get("fix") or "")
                   for g in data["gates"] if g["gate"] == "pool-context" for f in g["findings"])
    assert f"prompts of {lo:,} to {hi:,} tokens" in why
    assert f"{limit:,}" in why
    m = figure(r"\*\*admission (\w+)es\*\* and \*\*transfer-read (\w+)s\*\* on 0\.5\.22 "
               r"\(both (\w+) on 0\.5\.19, with the incident's (\d+)-step trace; the "
               r"warning: a KV write that outlives the 30 s deferral timeout can land in the "
               r"pages of a request decode resumes from a memory retraction\), "
               r"\*\*lifetime (\w+)s\*\*")
    assert verdict["admission"] == m.group(1)
    assert verdict["transfer-read"] == m.group(2)
    assert verdict["lifetime"] == m.group(5)
    read = next(g for g in data["gates"] if g["gate"] == "transfer-read")
    assert {f.get("finding") for f in read["findings"] if f["verdict"] == "warn"} == {
        "late-write-into-resumed-request"}
    k = args.index("--release")
    args[k + 1] = "0.5.19"
    old = json.loads(run(*args, "--out", "out19", "--json", cwd=tmp_path).stdout)
    verdict19 = {g["gate"]: g["verdict"] for g in old["gates"]}
    assert verdict19["admission"] == verdict19["transfer-read"] == m.group(3)
    lengths = {f.get("trace_length") for g in old["gates"] if g["gate"] == "transfer-read"
               for f in g["findings"] if f.get("property") == "no-foreign-kv-read"}
    assert _number(m.group(4)) in lengths
