"""Carts and the items in them. Prices are whole cents."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Item:
    sku: str
    price_cents: int
    quantity: int = 1


@dataclass
class Cart:
    items: list[Item] = field(default_factory=list)

    def add(self, item: Item) -> None:
        self.items.append(item)

    def total_cents(self) -> int:
        return sum(item.price_cents * item.quantity for item in self.items)

    def item_count(self) -> int:
        return sum(item.quantity for item in self.items)

    def average_price_cents(self) -> int:
        """Average price per unit, rounded down; 0 for an empty cart."""
        return self.total_cents() // self.item_count()
