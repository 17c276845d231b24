# Copyright: rigops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The model_weights role's record of what is staged, and its peers (model_weights_peers), as filters run on
the controller.

- ``placed | staged_record``: model_weights_staged, for each instance where its model lies
  (``{instance: {"path", "source", "id", "revision", "commit", "trust_remote_code"}}``, docs/instances.md),
  from the module's results for the models placed (those without a path left out);
- ``stage_results | peer_models``: the host's staged ``fleet_cache`` models as its peer serves them:
  ``[{"hub", "id", "commit", "path", "files": [{"path", "size", "sha256"}]}]`` (the marker's files);
- ``peer_models | peer_refs``: the ``<hub>/<id>@<commit>`` a peer publishes, which the pulling host's
  module_utils model_weights.peer_urls matches.
"""

from ansible_collections.rigops.fleet.plugins.module_utils.model_weights import peer_model_ref


def staged_record(placed):
    out = {}
    for r in placed or []:
        if "path" not in r:
            continue
        item = r["item"]
        for instance in item.get("instances") or []:
            out[instance] = {
                "path": r["path"],
                "source": item["source"],
                "id": item["id"],
                "revision": item["revision"],
                "commit": r.get("commit") or "",
                "trust_remote_code": r.get("trust_remote_code") or False,
            }
    return out


def peer_models(results):
    out = []
    for r in results or []:
        item = r.get("item") or {}
        if item.get("source") != "fleet_cache" or not r.get("staged") or not r.get("files"):
            continue
        out.append(
            {
                "hub": item["hub"],
                "id": item["id"],
                "commit": r["commit"],
                "path": r["path"],
                "files": [{"path": f["path"], "size": f["size"], "sha256": f.get("sha256")} for f in r["files"]],
            }
        )
    return out


def peer_refs(models):
    return [peer_model_ref(m["hub"], m["id"], m["commit"]) for m in models or []]


class FilterModule:
    def filters(self):
        return {"staged_record": staged_record, "peer_models": peer_models, "peer_refs": peer_refs}
