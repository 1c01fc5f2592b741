from django.urls import path
from shop.views import place_order, place_order_autocommit

urlpatterns = [
    path("orders", place_order),
    path("orders/autocommit", place_order_autocommit),
]
