"""What the checkout page shows about a cart."""

from shopcart.cart import Cart


def summary(cart: Cart) -> dict[str, int]:
    return {
        "total_cents": cart.total_cents(),
        "items": cart.item_count(),
        "average_price_cents": cart.average_price_cents(),
    }
