"""A view that places an order and enqueues its shipping: in the request's transaction, after it,
or in autocommit."""

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from shop.jobs import ship
from shop.models import Order
from ultimat3.contrib.django import enqueue, enqueue_on_commit


class Failed(Exception):
    pass


@csrf_exempt
def place_order(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    org = request.headers["X-Org"]
    placed: dict[str, object] = {}
    try:
        with transaction.atomic():
            order = Order.objects.create(email=body["email"], code="X")
            placed["order"] = order.pk
            ref = {"org": org, "order_id": order.pk}
            if body["mode"] == "atomic":
                placed["job"] = enqueue(ship, ref).id
            else:
                enqueue_on_commit(ship, ref)
            if body.get("fail"):
                raise Failed
    except Failed:
        return JsonResponse(placed, status=500)
    return JsonResponse(placed, status=201)


@csrf_exempt
def place_order_autocommit(request: HttpRequest) -> JsonResponse:
    body = json.loads(request.body)
    order = Order.objects.create(email=body["email"], code="X")
    result = ship.enqueue({"org": request.headers["X-Org"], "order_id": order.pk})
    return JsonResponse({"order": order.pk, "job": result.id}, status=201)
