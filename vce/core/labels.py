"""The 17 RARE-VISION labels, exactly as the challenge spells them, in the challenge's order."""

from vce.core.errors import DataError

ANATOMY = (
    "mouth",
    "esophagus",
    "stomach",
    "small intestine",
    "colon",
    "z-line",
    "pylorus",
    "ileocecal valve",
)
PATHOLOGY = (
    "active bleeding",
    "angiectasia",
    "blood",
    "erosion",
    "erythema",
    "hematin",
    "lymphangioectasis",
    "polyp",
    "ulcer",
)
LABELS = ANATOMY + PATHOLOGY
NUM_LABELS = len(LABELS)
LABEL_INDEX = {name: i for i, name in enumerate(LABELS)}

# Regions a capsule passes in this order; landmarks sit between consecutive regions.
REGIONS = ("mouth", "esophagus", "stomach", "small intestine", "colon")
LANDMARKS = {
    "z-line": ("esophagus", "stomach"),
    "pylorus": ("stomach", "small intestine"),
    "ileocecal valve": ("small intestine", "colon"),
}


def check_labels(names, where: str) -> None:
    """Raise ValueError naming `where` if any of `names` is not one of the 17 labels."""
    unknown = [n for n in names if n not in LABEL_INDEX]
    if unknown:
        raise DataError(
            f"{where}: unknown label(s) {unknown}; allowed: {list(LABELS)}"
        )
