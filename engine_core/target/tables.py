"""The product's target tables (schema `crm`, migrations 0003, 0005 and 0016): which columns a
mapped row may fill and which of them are jsonb. `engine_core.target.crm` writes through these."""
from __future__ import annotations

from dataclasses import dataclass

from psycopg import sql


@dataclass(frozen=True)
class Table:
    """A target table: its name, the columns a mapped row may fill, which of them are jsonb, and
    its schema (`crm`, or `public` for the example provider's own table)."""

    name: str
    columns: frozenset[str]
    jsonb: frozenset[str]
    schema: str = "crm"

    @property
    def record_type(self) -> str:
        """The ledger's `record_type` (`crm.contacts`; a table outside `crm` is its bare name)."""
        return f"crm.{self.name}" if self.schema == "crm" else self.name

    @property
    def identifier(self) -> sql.Identifier:
        """The table's schema-qualified SQL identifier."""
        return sql.Identifier(self.schema, self.name)


def _table(name: str, columns: str, jsonb: str = "") -> Table:
    common = "tenant_id source source_id source_created_at source_updated_at"
    return Table(name, frozenset((columns + " " + common).split()), frozenset(jsonb.split()))


TABLES: dict[str, Table] = {
    t.name: t
    for t in (
        _table("users", "name email phone active is_admin timezone locale"),
        _table("pipelines", "name position active deal_probability_enabled"),
        _table("stages", "pipeline_id name position active deal_probability rotten_after_days"),
        _table(
            "companies",
            "name domain owner_id address label_ids visible_to custom_fields",
            "address label_ids custom_fields",
        ),
        _table(
            "contacts",
            "name first_name last_name email emails phones job_title company_id owner_id postal_address birthday"
            " label_ids visible_to custom_fields dangling_refs",
            "emails phones postal_address label_ids custom_fields dangling_refs",
        ),
        _table(
            "deals",
            "title value currency status archived archived_at contact_id company_id owner_id pipeline_id stage_id"
            " pipeline_ref stage_ref"
            " probability lost_reason expected_close_date closed_at won_at lost_at stage_changed_at origin label_ids"
            " visible_to custom_fields dangling_refs",
            "label_ids custom_fields dangling_refs",
        ),
        _table(
            "leads",
            "title value currency archived contact_id company_id owner_id source_name expected_close_date was_seen"
            " label_ids visible_to custom_fields dangling_refs",
            "label_ids custom_fields dangling_refs",
        ),
        _table(
            "activities",
            "subject activity_type done done_at due_date due_time duration busy location note public_description"
            " participants deal_id lead_id contact_id company_id owner_id custom_fields dangling_refs",
            "location participants custom_fields dangling_refs",
        ),
        _table("notes", "content deal_id lead_id contact_id company_id author_id pinned dangling_refs"
               " content_truncated content_original_length",  # migration 0014: fit_text(NOTE_CONTENT_MAX)
               "pinned dangling_refs"),
        _table(
            "emails",
            "deal_id subject snippet body sender recipients sent_at outbound thread_ref has_attachments"
            " body_truncated body_original_length body_unavailable",  # migration 0009: fit_email_body
            "sender recipients",
        ),
        _table("products", "name code description unit tax category active selectable visible_to owner_id prices"
               " billing_frequency billing_frequency_cycles custom_fields", "prices custom_fields"),
        _table("deal_products", "deal_id product_id product_ref name quantity item_price discount discount_type tax"
               " tax_method sum currency order_nr comments enabled billing_frequency billing_frequency_cycles"
               " billing_start_date"),
        _table("files", "name file_name file_type file_size description deal_id lead_id contact_id company_id"
               " activity_id product_id owner_id remote_location content_status content_sha256 dangling_refs",
               "dangling_refs"),
        _table("deal_participants", "deal_id contact_id contact_ref added_by_id active"),
        _table("followers", "user_id user_ref deal_id contact_id company_id"),
        _table("deal_history", "deal_id field_key old_value new_value changed_at actor_id change_source"),
        # the example provider's target (engine_core/providers/example.py), outside the CRM
        Table("example_items", frozenset("tenant_id kind source_id parent_id payload".split()), frozenset({"payload"}),
              schema="public"),
    )
}
