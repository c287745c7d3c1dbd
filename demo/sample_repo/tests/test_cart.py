import unittest

from shopcart.cart import Cart, Item
from shopcart.checkout import summary


class CartTest(unittest.TestCase):
    def test_total_counts_quantities(self):
        cart = Cart([Item("apple", 50, 3), Item("pear", 120)])
        self.assertEqual(cart.total_cents(), 270)

    def test_average_price_rounds_down(self):
        cart = Cart([Item("apple", 50, 2), Item("pear", 101)])
        self.assertEqual(cart.average_price_cents(), 67)

    def test_average_price_of_empty_cart_is_zero(self):
        self.assertEqual(Cart().average_price_cents(), 0)

    def test_summary_of_empty_cart(self):
        self.assertEqual(summary(Cart()), {"total_cents": 0, "items": 0, "average_price_cents": 0})


if __name__ == "__main__":
    unittest.main()
