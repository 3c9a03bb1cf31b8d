"""The source scan the conformance worker uses to find transfer backends that
accept decode host destinations (``reqmodel.conform.sourcescan``)."""
import pathlib

import pytest

from reqmodel.conform import sourcescan

BASE = '''
class BaseKVManager:
    supports_host_destination: bool = False

class BaseKVReceiver:
    @property
    def supports_host_destination(self) -> bool:
        """Whether this receiver's peer supports host destinations."""
        return False
'''


def tree(tmp_path: pathlib.Path, backend: str) -> pathlib.Path:
    pkg = tmp_path / "disaggregation"
    (pkg / "base").mkdir(parents=True)
    (pkg / "base" / "conn.py").write_text(BASE)
    (pkg / "mooncake").mkdir()
    (pkg / "mooncake" / "conn.py").write_text(backend)
    return pkg


def test_the_base_classes_saying_false_are_not_reported(tmp_path):
    assert sourcescan.host_destination_classes(tree(tmp_path, "class M:\n    pass\n")) == []


@pytest.mark.parametrize("body", [
    "    supports_host_destination = True\n",
    "    supports_host_destination: bool = True\n",
    "    supports_host_destination = FLAG\n",
    "    @property\n    def supports_host_destination(self):\n        return self.ok\n",
    "    @property\n    def supports_host_destination(self):\n        '''doc'''\n        return True\n",
])
def test_a_backend_declaring_anything_but_false_is_reported(tmp_path, body):
    pkg = tree(tmp_path, "class MooncakeKVManager(BaseKVManager):\n" + body)
    assert sourcescan.host_destination_classes(pkg) == ["mooncake/conn.py:MooncakeKVManager"]


@pytest.mark.parametrize("call,found", [
    ("self.r.ensure_abort_notified(force_arm=True)", ["pop_transferred:3"]),
    ("self.r.ensure_abort_notified(force_arm=False)", []),
    ("self.r.ensure_abort_notified()", []),
    ("self.r.abort()", []),
])
def test_force_armed_failure_calls_are_found_by_function_and_line(tmp_path, call, found):
    src = tmp_path / "decode.py"
    src.write_text(f"class Q:\n    def pop_transferred(self):\n        {call}\n")
    assert sourcescan.force_armed_failure_calls(src) == found
