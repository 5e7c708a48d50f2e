"""API server errors mapped back to request fields (422/400/webhook) and to permission messages (403)."""

from __future__ import annotations

import json

from kubernetes.client import ApiException

from trainflow.core.errors import BackendError, InvalidRequest, TrainJobNotFound
from trainflow.core.kube.apierrors import translate


def status_error(
    code: int, message: str, causes: list[dict] | None = None, reason: str = "Invalid"
) -> ApiException:
    exc = ApiException(status=code, reason=reason)
    body = {"kind": "Status", "status": "Failure", "message": message, "reason": reason, "code": code}
    if causes is not None:
        body["details"] = {"name": "j", "group": "trainer.kubeflow.org", "kind": "TrainJob", "causes": causes}
    exc.body = json.dumps(body)
    return exc


def test_422_causes_name_the_request_fields():
    exc = status_error(
        422,
        'TrainJob.trainer.kubeflow.org "j" is invalid: [spec.trainer.numNodes: Invalid value: -1, ...]',
        [
            {
                "reason": "FieldValueInvalid",
                "message": "Invalid value: -1: must be >= 1",
                "field": "spec.trainer.numNodes",
            },
            {
                "reason": "FieldValueInvalid",
                "message": 'Invalid value: "string": spec.initializer.dataset.storageUri must be a URI',
                "field": "",
            },
        ],
    )
    err = translate(exc, "create", "trainjobs", "ns", "j")
    assert isinstance(err, InvalidRequest)
    assert err.fields == ["num_nodes", "dataset_uri"]
    assert "must be >= 1" in str(err)


def test_webhook_denial_is_an_invalid_request_not_a_permission_error():
    exc = status_error(
        403,
        'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '
        'spec.trainer.env[0]: Invalid value: "PET_NNODES": must not have reserved envs',
        reason="Forbidden",
    )
    err = translate(exc, "create", "trainjobs", "ns", "j")
    assert isinstance(err, InvalidRequest)
    assert err.fields == ["env"]


def test_rbac_403_names_verb_and_resource():
    exc = status_error(
        403,
        'trainjobs.trainer.kubeflow.org is forbidden: User "system:serviceaccount:ns:bot" cannot create resource',
        reason="Forbidden",
    )
    err = translate(exc, "create", "trainjobs", "ns", "j")
    assert isinstance(err, BackendError)
    assert "cannot create trainjobs/j in namespace 'ns'" in str(err)


def test_404_on_a_trainjob_is_not_found():
    err = translate(status_error(404, "not found", reason="NotFound"), "get", "trainjobs", "ns", "j")
    assert isinstance(err, TrainJobNotFound)


def test_non_api_errors_pass_through():
    boom = KeyError("x")
    assert translate(boom, "get", "trainjobs", "ns", "j") is boom
