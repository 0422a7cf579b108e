"""Repository-wide checks: the layout and import graph, one implementation per concept, one median, the public API,
the one configuration schema."""
