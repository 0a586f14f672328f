import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIXTURES = ROOT.parent / "shared" / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"shared fixtures not found at {FIXTURES} (CI lays shared/ beside the clone)")
    return FIXTURES
