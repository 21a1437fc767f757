"""The UI's GraphQL calls, as the tests make them: add a partition, launch, re-execute, terminate."""
from __future__ import annotations

from typing import Any

import httpx

LOCATION = "migration_pipeline.definitions"
REPOSITORY = "__repository__"
REPO = {"repositoryName": REPOSITORY, "repositoryLocationName": LOCATION}


class GraphQLError(RuntimeError):
    pass


class UI:
    def __init__(self, url: str) -> None:
        self.url = url

    def q(self, query: str, **variables: Any) -> dict[str, Any]:
        r = httpx.post(self.url, json={"query": query, "variables": variables}, timeout=60)
        body = r.json()
        if body.get("errors"):
            raise GraphQLError(str(body["errors"])[:2000])
        return body["data"]

    def add_partition(self, key: str) -> None:
        d = self.q(
            """mutation($repo: RepositorySelector!, $key: String!) {
                 addDynamicPartition(repositorySelector: $repo, partitionsDefName: "tenants", partitionKey: $key) {
                   __typename ... on PythonError { message } ... on UnauthorizedError { message } } }""",
            repo=REPO, key=key)
        if d["addDynamicPartition"]["__typename"] not in ("AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"):
            raise GraphQLError(str(d))

    def launch(self, job: str, partition: str, asset_paths: list[list[str]] | None = None,
               run_config: dict[str, Any] | None = None) -> str:
        """What the job page's launchpad (job) or the asset graph's Materialize (__ASSET_JOB) sends."""
        selector: dict[str, Any] = {**REPO, "jobName": job}
        if asset_paths is not None:
            selector["assetSelection"] = [{"path": p} for p in asset_paths]
        d = self.q(
            """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
                 __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
                 ... on RunConfigValidationInvalid { errors { message } } ... on InvalidSubsetError { message } } }""",
            params={"selector": selector, "runConfigData": run_config or {},
                    "executionMetadata": {"tags": [{"key": "dagster/partition", "value": partition}]}})
        out = d["launchRun"]
        if out["__typename"] != "LaunchRunSuccess":
            raise GraphQLError(str(out))
        return out["run"]["runId"]

    def reexecute_from_failure(self, run_id: str) -> str:
        d = self.q(
            """mutation($p: ReexecutionParams!) { launchRunReexecution(reexecutionParams: $p) {
                 __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
            p={"parentRunId": run_id, "strategy": "FROM_FAILURE"})
        out = d["launchRunReexecution"]
        if out["__typename"] != "LaunchRunSuccess":
            raise GraphQLError(str(out))
        return out["run"]["runId"]

    def terminate(self, run_id: str) -> None:
        d = self.q(
            """mutation($id: String!) { terminateRun(runId: $id) { __typename
                 ... on TerminateRunFailure { message } ... on PythonError { message } } }""", id=run_id)
        if d["terminateRun"]["__typename"] != "TerminateRunSuccess":
            raise GraphQLError(str(d))

    def phase_assets(self) -> list[dict[str, Any]]:
        return self.q("""{ assetNodes { assetKey { path } isPartitioned
                            partitionDefinition { type dimensionTypes { dynamicPartitionsDefinitionName } } } }""")["assetNodes"]

    def partition_keys(self, asset_path: list[str]) -> list[str]:
        d = self.q("""query($k: AssetKeyInput!) { assetNodeOrError(assetKey: $k) {
                        ... on AssetNode { partitionKeys } } }""", k={"path": asset_path})
        return d["assetNodeOrError"]["partitionKeys"]

    def backfill(self, partitions: list[str], asset_paths: list[list[str]], run_config: dict[str, Any] | None = None) -> str:
        """The asset graph's "Materialize" -> backfill of the chosen (e.g. failed) partitions."""
        params: dict[str, Any] = {"partitionNames": partitions, "assetSelection": [{"path": p} for p in asset_paths]}
        if run_config is not None:
            params["runConfigData"] = run_config
        d = self.q(
            """mutation($p: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $p) {
                 __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message }
                 ... on UnauthorizedError { message } ... on PartitionSetNotFoundError { message } } }""", p=params)
        out = d["launchPartitionBackfill"]
        if out["__typename"] != "LaunchBackfillSuccess":
            raise GraphQLError(str(out))
        return out["backfillId"]

    def backfill_status(self, backfill_id: str) -> str:
        d = self.q("""query($id: String!) { partitionBackfillOrError(backfillId: $id) {
                        __typename ... on PartitionBackfill { status } ... on PythonError { message } } }""", id=backfill_id)
        out = d["partitionBackfillOrError"]
        if out["__typename"] != "PartitionBackfill":
            raise GraphQLError(str(out))
        return out["status"]
