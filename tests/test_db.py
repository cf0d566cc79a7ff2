"""Copy-on-write views: isolation, canonical hashing, readable diffs."""

import random
import threading

import pytest

from muarl.db import Database, diff


def test_256_envs_written_from_threads_never_see_each_others_writes(retail):
    orders = sorted(retail.database().tables["orders"])
    pending = [o for o in orders if retail.database().tables["orders"][o]["status"] == "pending"]
    envs = [retail.env() for _ in range(256)]
    base_hash = retail.database().view().hash()
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            barrier.wait()
            for i in range(worker, 256, 8):
                env = envs[i]
                order = pending[i % len(pending)]
                env.db.users.edit(env.db.orders[order]["user_id"])["email"] = f"env{i}@example.com"
                rec = env.call("cancel_pending_order", {"order_id": order, "reason": "ordered by mistake"})
                assert rec.ok, rec.output
        except BaseException as err:  # surfaced below: a thread's assert would otherwise be lost
            errors.append(err)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, env in enumerate(envs):
        order = pending[i % len(pending)]
        assert env.db.orders[order]["status"] == "cancelled"
        assert env.db.users[env.db.orders[order]["user_id"]]["email"] == f"env{i}@example.com"
        # nothing but its own writes: every other pending order is still pending in this env
        others = [o for o in pending if o != order][:20]
        assert all(env.db.orders[o]["status"] == "pending" for o in others)
    assert retail.database().view().hash() == base_hash
    assert all(retail.database().tables["orders"][o]["status"] == "pending" for o in pending)
    hashes = {env.hash() for env in envs}
    assert len(hashes) == 256


def test_base_data_cannot_be_mutated_through_a_view(retail):
    env = retail.env()
    order_id = next(iter(env.db.orders))
    with pytest.raises(TypeError):
        env.db.orders[order_id]["status"] = "cancelled"  # reads are read-only ...
    with pytest.raises(AttributeError):
        env.db.orders[order_id]["items"].append({})
    env.db.orders.edit(order_id)["status"] = "x"  # ... writes go through edit()
    assert retail.database().tables["orders"][order_id]["status"] != "x"


def _shuffled(value, rng):
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: _shuffled(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def test_hash_is_independent_of_key_order(retail):
    tables = retail.database().to_dict()
    a = Database(tables).view()
    b = Database(_shuffled(tables, random.Random(1))).view()
    assert list(a.base.tables["users"]) != list(b.base.tables["users"])
    assert a.hash() == b.hash()
    # ... but sensitive to any value, and to the order inside lists
    user = next(iter(tables["users"]))
    b.users.edit(user)["address"]["zip"] = "00000"
    assert a.hash() != b.hash()
    c = Database(tables).view()
    multi = next(u for u, rec in tables["users"].items() if len(rec["orders"]) >= 2)
    c.users.edit(multi)["orders"].reverse()
    assert c.hash() != a.hash()


def test_hash_of_view_equals_hash_of_materialised_copy(retail):
    env = retail.env()
    order = next(o for o, r in env.db.orders.items() if r["status"] == "pending")
    env.call("cancel_pending_order", {"order_id": order, "reason": "no longer needed"})
    env.db.users.insert("new_user", {"user_id": "new_user"})
    env.db.products.delete(next(iter(env.db.products)))
    assert Database(env.db.to_dict()).view().hash() == env.hash()


def test_diff_names_each_changed_field():
    base = Database({"orders": {"#1": {"status": "pending", "items": [{"id": "a", "price": 1.0}]},
                                "#2": {"status": "pending", "items": []}}})
    expected, actual = base.view(), base.view()
    expected.orders.edit("#1")["status"] = "cancelled"
    actual.orders.edit("#1")["items"][0]["price"] = 2.0
    actual.orders.insert("#3", {"status": "new"})
    actual.orders.delete("#2")
    lines = diff(expected, actual)
    assert 'orders["#1"].status: "cancelled" -> "pending"' in lines
    assert 'orders["#1"].items[0].price: 1.0 -> 2.0' in lines
    assert any(line.startswith('orders["#2"]: missing') for line in lines)
    assert any(line.startswith('orders["#3"]: unexpected record') for line in lines)
    assert diff(expected, expected) == []
    # unrelated bases fall back to a full comparison
    other = Database({"orders": {"#1": {"status": "pending", "items": [{"id": "a", "price": 1.0}]}}}).view()
    assert diff(base.view(), other) == ['orders["#2"]: missing (expected {"status": "pending", "items": []})']


def test_bad_tables_are_rejected():
    with pytest.raises(TypeError, match="table 'orders' must be a mapping"):
        Database({"orders": [1, 2]})
    with pytest.raises(KeyError, match="no table 'nope'"):
        Database({"orders": {}}).view()["nope"]
