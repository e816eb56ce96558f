"""The values bench.strategies writes: customer profiles of 20 fields, the JSON Schema they
conform to (types, enums, string patterns, a nested object, array items), and partial updates
of a few fields each for the merge strategy."""

from __future__ import annotations

import random
from typing import Any

_DATE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?Z$"
PLANS = ["free", "starter", "pro", "enterprise"]
STATUSES = ["active", "suspended", "pending", "closed"]
ROLES = ["viewer", "editor", "admin", "billing"]
THEMES = ["light", "dark", "system"]
TAGS = ["beta", "vip", "churn-risk", "newsletter", "trial", "partner", "eu", "us", "mobile",
        "api-user", "support-heavy", "annual"]
CITIES = [("Berlin", "DE"), ("Paris", "FR"), ("Austin", "US"), ("Osaka", "JP"),
          ("Lyon", "FR"), ("Toronto", "CA"), ("Leeds", "GB"), ("Porto", "PT")]
LOCALES = ["en-US", "de-DE", "fr-FR", "ja-JP", "pt-PT", "en-GB"]
ZONES = ["Europe/Berlin", "Europe/Paris", "America/Chicago", "Asia/Tokyo", "Europe/London"]
NAMES = ["ada", "grace", "alan", "edsger", "barbara", "ken", "dennis", "margaret", "linus",
         "radia", "frances", "john"]

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["id", "name", "email", "plan", "status", "created_at", "address", "roles"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "pattern": "^user-[0-9]{6}$"},
        "name": {"type": "string", "minLength": 1, "maxLength": 100},
        "email": {"type": "string", "maxLength": 254,
                  "pattern": r"^[a-z0-9._-]+@[a-z0-9.-]+\.[a-z]{2,}$"},
        "age": {"type": "integer", "minimum": 13, "maximum": 130},
        "plan": {"enum": PLANS},
        "status": {"enum": STATUSES},
        "score": {"type": "number", "minimum": 0, "maximum": 100},
        "verified": {"type": "boolean"},
        "locale": {"type": "string", "pattern": "^[a-z]{2}-[A-Z]{2}$"},
        "timezone": {"type": "string", "pattern": "^[A-Za-z]+/[A-Za-z_]+$"},
        "phone": {"type": "string", "pattern": r"^\+[0-9]{1,3}-[0-9]{3}-[0-9]{3}-[0-9]{4}$"},
        "created_at": {"type": "string", "format": "date-time", "pattern": _DATE},
        "last_login": {"type": ["string", "null"], "pattern": _DATE},
        "tags": {"type": "array", "maxItems": 10, "uniqueItems": True,
                 "items": {"type": "string", "pattern": "^[a-z][a-z0-9-]{1,30}$"}},
        "roles": {"type": "array", "minItems": 1, "uniqueItems": True, "items": {"enum": ROLES}},
        "address": {
            "type": "object", "required": ["city", "country"], "additionalProperties": False,
            "properties": {
                "street": {"type": "string", "maxLength": 200},
                "city": {"type": "string", "minLength": 1, "maxLength": 100},
                "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
        },
        "preferences": {
            "type": "object", "additionalProperties": False,
            "properties": {
                "theme": {"enum": THEMES},
                "newsletter": {"type": "boolean"},
                "language": {"type": "string", "pattern": "^[a-z]{2}$"},
            },
        },
        "limits": {
            "type": "object", "required": ["requests_per_minute", "storage_mb"],
            "properties": {
                "requests_per_minute": {"type": "integer", "minimum": 0, "maximum": 100_000},
                "storage_mb": {"type": "integer", "minimum": 0},
            },
        },
        "notes": {"type": "string", "maxLength": 500},
        "version": {"type": "integer", "minimum": 1},
    },
}


def _time(rng: random.Random) -> str:
    return (f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T"
            f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}.000Z")


def profile(rng: random.Random, n: int) -> dict[str, Any]:
    """A customer profile that conforms to SCHEMA (about 700 bytes as JSON)."""
    name = rng.choice(NAMES)
    city, country = rng.choice(CITIES)
    return {
        "id": f"user-{n:06d}",
        "name": f"{name.title()} {rng.choice(NAMES).title()}",
        "email": f"{name}.{n}@example.com",
        "age": rng.randint(18, 90),
        "plan": rng.choice(PLANS),
        "status": rng.choice(STATUSES),
        "score": round(rng.uniform(0, 100), 2),
        "verified": rng.random() < 0.7,
        "locale": rng.choice(LOCALES),
        "timezone": rng.choice(ZONES),
        "phone": f"+{rng.randint(1, 99)}-555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
        "created_at": _time(rng),
        "last_login": _time(rng),
        "tags": rng.sample(TAGS, rng.randint(1, 4)),
        "roles": rng.sample(ROLES, rng.randint(1, 2)),
        "address": {"street": f"{rng.randint(1, 200)} Main Street", "city": city,
                    "country": country, "zip": f"{rng.randint(10000, 99999)}"},
        "preferences": {"theme": rng.choice(THEMES), "newsletter": rng.random() < 0.5,
                        "language": rng.choice(LOCALES)[:2]},
        "limits": {"requests_per_minute": rng.choice([60, 600, 6000]),
                   "storage_mb": rng.choice([512, 4096, 65536])},
        "notes": "Prefers email contact; renewal discussed in the last quarterly review.",
        "version": rng.randint(1, 50),
    }


_CHANGES = {
    "score": lambda rng: round(rng.uniform(0, 100), 2),
    "status": lambda rng: rng.choice(STATUSES),
    "plan": lambda rng: rng.choice(PLANS),
    "last_login": _time,
    "version": lambda rng: rng.randint(1, 1000),
    "tags": lambda rng: rng.sample(TAGS, rng.randint(1, 4)),
    "preferences": lambda rng: {"theme": rng.choice(THEMES)},
    "limits": lambda rng: {"storage_mb": rng.choice([512, 4096, 65536])},
}


def partial(rng: random.Random, fields: int = 3) -> dict[str, Any]:
    """A merge update: `fields` fields of a profile, nested objects given in part."""
    return {name: _CHANGES[name](rng) for name in rng.sample(sorted(_CHANGES), fields)}
