"""Pipedrive products and deal products (a deal's lines) -> crm.products and crm.deal_products.

Pure functions, as in `mapping`. A line's deal is its parent (a line without its deal is not
written); its product is a soft link, and the source's product id is kept in `product_ref`,
because a line may name a product the source has purged (GET answers 404, the lists leave it out:
the sandbox draws ~2% such lines, as real accounts keep lines of deleted products).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_core import rows
from engine_core.providers.pipedrive.fields import FieldBook, custom_fields_v2
from engine_core.providers.pipedrive.mapping import (
    Mapped,
    MalformedRow,
    Ref,
    ref_to,
    _common,
    _link,
    day,
    flag,
    json_value,
    number,
    ref_id,
    row_source_id,
    source_version,
    text,
    visible_to,
)

_DISCOUNT_TYPES = ("percentage", "amount")


def _integer(row: Mapping[str, Any], name: str) -> int | None:
    value = row.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedRow(f"{name} is not an integer: {value!r}"[:80])
    return value


def _prices(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    prices = json_value(row, "prices", list) or []
    for p in prices:
        if not isinstance(p, Mapping) or not isinstance(p.get("currency"), str):
            raise MalformedRow("prices has an entry without a currency")
        number(p, "price")
        number(p, "cost")
    return prices


def map_product(row: Mapping[str, Any], tenant_id: str, book: FieldBook) -> Mapped:
    """A v2 product (`/api/v2/products`) as a crm.products row; its prices kept as served (one per
    currency). Raises MalformedRow naming the field."""
    sid = row_source_id(row, "products")
    links: list[Ref] = []
    _link(links, "owner_id", "user", ref_id(row, "owner_id"))
    deleted = flag(row, "is_deleted")
    values = {
        **_common(row, sid, tenant_id),
        "name": text(row, "name", required=True),
        "code": text(row, "code"),
        "description": text(row, "description", limit=100_000),
        "unit": text(row, "unit"),
        "tax": number(row, "tax"),
        "category": None if row.get("category") is None else str(row.get("category")),
        "active": deleted is not True,
        "selectable": flag(row, "is_linkable"),
        "visible_to": visible_to(row),
        "prices": _prices(row),
        "billing_frequency": text(row, "billing_frequency"),
        "billing_frequency_cycles": _integer(row, "billing_frequency_cycles"),
        "custom_fields": custom_fields_v2(book, "product", row, links),
    }
    return Mapped("products", sid, values, links=links, version=source_version(row))


def map_deal_product(row: Mapping[str, Any], tenant_id: str, book: FieldBook | None = None) -> Mapped:
    """One line of `/api/v2/deals/products` as a crm.deal_products row: its deal a parent, its
    product a soft link (`product_ref` keeps the source's id). Raises MalformedRow naming the field."""
    sid = row_source_id(row, "deal_products")
    deal = ref_id(row, "deal_id")
    if deal is None:
        raise MalformedRow("deal_id is missing")
    product = ref_id(row, "product_id")
    parents: list[Ref] = [ref_to("deal_id", "deal", deal, "deal_id")]
    links: list[rows.Ref] = []
    if product is not None:
        links.append(rows.Ref("product_id", "products", product, "product_id"))
    discount_type = text(row, "discount_type")
    if discount_type is not None and discount_type not in _DISCOUNT_TYPES:
        raise MalformedRow(f"discount_type is not percentage or amount: {discount_type!r}"[:80])
    values = {
        **_common(row, sid, tenant_id),
        "product_ref": product,
        "name": text(row, "name"),
        "quantity": number(row, "quantity"),
        "item_price": number(row, "item_price"),
        "discount": number(row, "discount"),
        "discount_type": discount_type,
        "tax": number(row, "tax"),
        "tax_method": text(row, "tax_method"),
        "sum": number(row, "sum"),
        "currency": text(row, "currency"),
        "order_nr": _integer(row, "order_nr"),
        "comments": text(row, "comments", limit=100_000),
        "enabled": flag(row, "is_enabled"),
        "billing_frequency": text(row, "billing_frequency"),
        "billing_frequency_cycles": _integer(row, "billing_frequency_cycles"),
        "billing_start_date": day(row, "billing_start_date"),
    }
    return Mapped("deal_products", sid, values, parents=parents, links=links, version=source_version(row))
