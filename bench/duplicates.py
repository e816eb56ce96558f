"""Near-duplicate threshold: `python -m bench.duplicates`.

Embeds bench/recall_corpus.py's memories with the builtin embedder and reports, per candidate
threshold, how many pairs of distinct memories of one owner reach it (each would be listed as
a near duplicate wrongly) and how many restatements below (one memory said again in other
words) reach it, as a create's `near_duplicates` compares them (cosine of unit vectors)."""

from __future__ import annotations

import argparse
import itertools
import json

import numpy as np

from bench.recall_corpus import MEMORIES
from broker.amp.duplicates import THRESHOLD
from broker.amp.embedders import _wordllama, unit_rows

# (label of a memory in the corpus, the same memory said again)
RESTATED = [
    ("ana-peanuts", "Ana has a peanut allergy and always carries an EpiPen"),
    ("ana-coffee", "Ana takes her coffee black, without sugar"),
    ("bob-seat", "Bob always wants a window seat when he flies"),
    ("ana-cat", "Ana's grey cat Nube hates the vacuum cleaner"),
    ("ana-car", "Ana's car is a blue Toyota Corolla from 2016"),
    ("ana-shifts", "On Tuesdays and Thursdays Ana works the night shift"),
    ("bob-wine", "Bob likes Douro valley red wines"),
    ("ana-lactose", "Ana is lactose intolerant: keep milk out of her meals"),
    ("ana-birthday", "Ana's birthday is June 14, 1988"),
    ("ana-phone", "During the day Ana would rather get texts than calls"),
    ("ana-daughter", "Lucia, Ana's daughter, will be seven in March"),
    ("bob-gluten", "Bob is coeliac and cannot eat wheat or barley"),
]
THRESHOLDS = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def measure() -> dict[str, object]:
    model = _wordllama()
    texts = {label: text for label, _, _, text in MEMORIES}
    owners: dict[str, list[str]] = {}
    for label, owner, _, _ in MEMORIES:
        owners.setdefault(owner, []).append(label)
    distinct = []
    for labels in owners.values():
        rows = unit_rows(model.embed([texts[label] for label in labels]))
        similar = rows @ rows.T
        distinct += [float(similar[i, j])
                     for i, j in itertools.combinations(range(len(labels)), 2)]
    restated = []
    for label, again in RESTATED:
        rows = unit_rows(model.embed([texts[label], again]))
        restated.append(float(rows[0] @ rows[1]))
    spread = np.array(distinct)
    return {
        "distinct_pairs": len(distinct),
        "distinct_p50": round(float(np.percentile(spread, 50)), 3),
        "distinct_p99": round(float(np.percentile(spread, 99)), 3),
        "distinct_max": round(float(spread.max()), 3),
        "restatements": len(restated),
        "restated_min": round(min(restated), 3),
        "restated_median": round(float(np.median(restated)), 3),
        "by_threshold": {str(t): {"distinct_listed": sum(s >= t for s in distinct),
                                  "restatements_listed": sum(s >= t for s in restated)}
                         for t in THRESHOLDS},
        "threshold": THRESHOLD,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    found = measure()
    print(f"{found['distinct_pairs']} pairs of distinct memories of one owner: cosine p50 "
          f"{found['distinct_p50']}, p99 {found['distinct_p99']}, max {found['distinct_max']}")
    print(f"{found['restatements']} restatements: cosine min {found['restated_min']}, "
          f"median {found['restated_median']}")
    print("threshold  distinct pairs listed  restatements listed")
    for threshold, counts in found["by_threshold"].items():  # type: ignore[attr-defined]
        print(f"{threshold:>9}  {counts['distinct_listed']:>21}  "
              f"{counts['restatements_listed']:>19}")
    print(f"the broker's threshold: {found['threshold']}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(found, out, indent=2)


if __name__ == "__main__":
    main()
