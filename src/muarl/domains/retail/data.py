"""Seeded generator of the retail database: a product catalogue with variants, users and their orders.

Every value comes from one ``random.Random(seed)``, so a (seed, size) pair names one database exactly.
Some structure is planted on purpose so every task family finds hosts at any size: pending orders with
wireless earbuds (the paper's case study), delivered orders to return or exchange, and gift cards.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

FIRST = ["Emma", "Liam", "Olivia", "Noah", "Ava", "Mason", "Sophia", "Lucas", "Mia", "Ethan", "Isabella",
         "Yusuf", "Amara", "Chen", "Priya", "Mateo", "Fatima", "Omar", "Aisha", "Daniel", "Sofia", "Raj",
         "Lena", "Ivan", "Yuki", "Harper", "Leo", "Zoe", "Kai", "Nora", "Elijah", "Chloe", "Aarav", "Ingrid"]
LAST = ["Kim", "Garcia", "Smith", "Nguyen", "Patel", "Johnson", "Silva", "Muller", "Rossi", "Lopez", "Khan",
        "Brown", "Wilson", "Tanaka", "Ahmed", "Novak", "Moreau", "Santos", "Cohen", "Ito", "Davis", "Ali",
        "Hansen", "Martin", "Jensen", "Costa", "Sato", "Lee", "Walker", "Young"]
CITIES = [("Austin", "TX", "787"), ("Denver", "CO", "802"), ("Seattle", "WA", "981"), ("Boston", "MA", "021"),
          ("Portland", "OR", "972"), ("Chicago", "IL", "606"), ("Phoenix", "AZ", "850"), ("Atlanta", "GA", "303"),
          ("Columbus", "OH", "432"), ("San Diego", "CA", "921"), ("Nashville", "TN", "372"), ("Miami", "FL", "331")]
STREETS = ["Maple Ave", "Oak St", "Cedar Ln", "Pine Rd", "Elm St", "Lakeview Dr", "Hillcrest Rd", "River Rd",
           "Sunset Blvd", "Park Pl", "Main St", "Willow Way", "Birch Ct", "Highland Ave"]
CARD_BRANDS = ["visa", "mastercard", "amex", "discover"]

#: product name -> (option axes, price range). Variants are drawn from the product of the axes.
CATALOGUE: dict[str, tuple[dict[str, list[str]], tuple[float, float]]] = {
    "Wireless Earbuds": ({"color": ["black", "white", "blue", "green"], "battery life": ["6 hours", "8 hours", "10 hours"],
                          "water resistance": ["IPX4", "IPX7"]}, (59, 189)),
    "T-Shirt": ({"color": ["black", "white", "red", "navy", "green"], "size": ["S", "M", "L", "XL"],
                 "material": ["cotton", "polyester"]}, (12, 39)),
    "Water Bottle": ({"capacity": ["500ml", "750ml", "1000ml"], "material": ["stainless steel", "plastic", "glass"],
                      "color": ["black", "blue", "red", "white"]}, (9, 45)),
    "Desk Lamp": ({"color": ["black", "white", "silver"], "brightness": ["low", "medium", "high"],
                   "power source": ["AC adapter", "USB", "battery"]}, (19, 119)),
    "Backpack": ({"color": ["black", "grey", "green", "navy"], "size": ["small", "medium", "large"],
                  "material": ["nylon", "polyester", "leather"]}, (29, 179)),
    "Running Shoes": ({"size": ["7", "8", "9", "10", "11", "12"], "color": ["black", "white", "red", "blue"],
                       "material": ["mesh", "synthetic"]}, (49, 169)),
    "Mechanical Keyboard": ({"switch type": ["linear", "tactile", "clicky"], "backlight": ["none", "white", "RGB"],
                             "size": ["full size", "80%", "60%"]}, (49, 229)),
    "Office Chair": ({"material": ["mesh", "leather", "fabric"], "color": ["black", "grey", "blue"],
                      "armrest": ["fixed", "adjustable", "none"]}, (89, 489)),
    "Coffee Maker": ({"capacity": ["4 cups", "8 cups", "12 cups"], "type": ["drip", "espresso", "french press"],
                      "color": ["black", "silver", "red"]}, (24, 329)),
    "Yoga Mat": ({"thickness": ["4mm", "6mm", "8mm"], "material": ["PVC", "TPE", "natural rubber"],
                  "color": ["purple", "blue", "green", "black"]}, (18, 99)),
    "Bluetooth Speaker": ({"color": ["black", "blue", "red"], "battery life": ["10 hours", "20 hours"],
                           "water resistance": ["no", "yes"]}, (29, 199)),
    "Smart Watch": ({"color": ["black", "silver", "gold"], "band": ["silicone", "leather", "metal"],
                     "display": ["AMOLED", "LCD"]}, (99, 449)),
    "Headphones": ({"type": ["over-ear", "on-ear"], "connectivity": ["wired", "wireless"],
                    "color": ["black", "white", "blue", "red"]}, (39, 349)),
    "Hiking Boots": ({"size": ["7", "8", "9", "10", "11", "12"], "material": ["leather", "synthetic"],
                      "waterproof": ["yes", "no"]}, (79, 259)),
    "Tea Kettle": ({"material": ["stainless steel", "glass", "ceramic"], "capacity": ["1 liter", "1.5 liters", "2 liters"],
                    "stovetop compatibility": ["induction", "electric", "gas"]}, (19, 129)),
    "Air Purifier": ({"room size": ["small", "medium", "large"], "filter type": ["HEPA", "carbon", "ionic"],
                      "features": ["none", "night mode", "quiet operation"]}, (59, 499)),
}

ORDER_STATUS_WEIGHTS = {"pending": 0.35, "processed": 0.15, "delivered": 0.4, "cancelled": 0.1}


def _digits(rng: random.Random, n: int) -> str:
    return "".join(str(rng.randrange(10)) for _ in range(n))


def _catalogue(rng: random.Random) -> tuple[dict[str, Any], dict[str, list[str]]]:
    products: dict[str, Any] = {}
    by_name: dict[str, list[str]] = {}
    used: set[str] = set()
    for name, (axes, (low, high)) in CATALOGUE.items():
        pid = _fresh(rng, used, 10)
        combos = list(itertools.product(*axes.values()))
        rng.shuffle(combos)
        keep = combos[: max(6, int(len(combos) * 0.6))]
        if name == "Wireless Earbuds":  # the case study needs several blue variants to choose between
            blues = [c for c in combos if c[0] == "blue"]
            keep = list(dict.fromkeys(blues[:4] + keep))
        variants = {}
        for combo in keep:
            item_id = _fresh(rng, used, 10)
            variants[item_id] = {
                "item_id": item_id,
                "options": dict(zip(axes, combo, strict=True)),
                "available": rng.random() < 0.85,
                "price": round(rng.uniform(low, high), 2),
            }
        products[pid] = {"product_id": pid, "name": name, "variants": variants}
        by_name[name] = [pid]
    return products, by_name


def _fresh(rng: random.Random, used: set[str], n: int) -> str:
    while True:
        value = _digits(rng, n)
        if value not in used and value[0] != "0":
            used.add(value)
            return value


def random_address(rng: random.Random) -> dict[str, str]:
    city, state, zip3 = rng.choice(CITIES)
    return {
        "address1": f"{rng.randrange(10, 9999)} {rng.choice(STREETS)}",
        "address2": rng.choice(["", "", f"Suite {rng.randrange(100, 999)}", f"Apt {rng.randrange(1, 40)}"]),
        "city": city,
        "state": state,
        "country": "USA",
        "zip": f"{zip3}{rng.randrange(10, 99)}",
    }


def build_db(seed: int, size: int) -> dict[str, dict[str, Any]]:
    """The retail tables for ``size`` users: ``products``, ``users``, ``orders``."""
    if size < 1:
        raise ValueError("retail needs at least one user")
    rng = random.Random(f"retail:{seed}")
    products, _ = _catalogue(rng)
    earbuds_pid = next(pid for pid, p in products.items() if p["name"] == "Wireless Earbuds")
    users: dict[str, Any] = {}
    orders: dict[str, Any] = {}
    used_ids: set[str] = set()
    for _ in range(size):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        uid = f"{first.lower()}_{last.lower()}_{_fresh(rng, used_ids, 4)}"
        payments: dict[str, Any] = {}
        for _ in range(rng.randint(1, 3)):
            kind = rng.choice(["credit_card", "credit_card", "paypal", "gift_card"])
            pm_id = f"{kind}_{_fresh(rng, used_ids, 7)}"
            if kind == "credit_card":
                payments[pm_id] = {"id": pm_id, "source": kind, "brand": rng.choice(CARD_BRANDS),
                                   "last_four": _digits(rng, 4)}
            elif kind == "gift_card":
                payments[pm_id] = {"id": pm_id, "source": kind, "balance": float(rng.randrange(0, 300))}
            else:
                payments[pm_id] = {"id": pm_id, "source": kind}
        address = random_address(rng)
        user = {
            "user_id": uid,
            "name": {"first_name": first, "last_name": last},
            "address": address,
            "email": f"{first.lower()}.{last.lower()}{rng.randrange(10, 9999)}@example.com",
            "payment_methods": payments,
            "orders": [],
        }
        n_orders = rng.randint(1, 4)
        for k in range(n_orders):
            oid = f"#W{_fresh(rng, used_ids, 7)}"
            status = rng.choices(list(ORDER_STATUS_WEIGHTS), list(ORDER_STATUS_WEIGHTS.values()))[0]
            if k == 0:
                status = rng.choice(["pending", "delivered"])  # every user can host a write task
            chosen = rng.sample(sorted(products), rng.randint(1, 4))
            if k == 0 and status == "pending" and rng.random() < 0.4 and earbuds_pid not in chosen:
                chosen[0] = earbuds_pid
            items = []
            for pid in chosen:
                product = products[pid]
                variant = product["variants"][rng.choice(sorted(product["variants"]))]
                items.append({"name": product["name"], "product_id": pid, "item_id": variant["item_id"],
                              "price": variant["price"], "options": dict(variant["options"])})
            total = round(sum(i["price"] for i in items), 2)
            pm = rng.choice(sorted(payments))
            order: dict[str, Any] = {
                "order_id": oid,
                "user_id": uid,
                "address": dict(address),
                "items": items,
                "status": status,
                "fulfillments": [],
                "payment_history": [{"transaction_type": "payment", "amount": total, "payment_method_id": pm}],
            }
            if status in ("processed", "delivered"):
                order["fulfillments"] = [{"tracking_id": [_fresh(rng, used_ids, 12)],
                                          "item_ids": [i["item_id"] for i in items]}]
            if status == "cancelled":
                order["cancel_reason"] = rng.choice(["no longer needed", "ordered by mistake"])
                order["payment_history"].append({"transaction_type": "refund", "amount": total,
                                                 "payment_method_id": pm})
            orders[oid] = order
            user["orders"].append(oid)
        users[uid] = user
    return {"products": products, "users": users, "orders": orders}
