"""Tenant partitions: one dynamic partition per tenant, added from the UI, the CLI or the sensor."""
from __future__ import annotations

from dagster import DynamicPartitionsDefinition

TENANTS = "tenants"

tenants = DynamicPartitionsDefinition(name=TENANTS)
