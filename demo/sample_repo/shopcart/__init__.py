"""A tiny shopping cart, the sample repository of Baton's demo."""

from shopcart.cart import Cart, Item

__all__ = ["Cart", "Item"]
