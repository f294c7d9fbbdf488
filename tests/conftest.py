import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BIN = Path(sys.executable).parent


def tpupipe_cmd() -> list[str]:
    return [str(BIN / "tpupipe")]


os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# google-cloud-storage looks a bucket up in the background for its OpenTelemetry spans when OpenTelemetry is installed
# (google-cloud-aiplatform brings it): calls no test asked for, which the emulators' call lists would count.
os.environ.setdefault("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "true")
