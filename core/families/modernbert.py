"""ModernBERT: rotary positions (the table's size is the trained context, 8192), global and local attention;
no token type ids."""

from __future__ import annotations

from core.families.base import Family

MODERNBERT = Family("modernbert", ("modernbert",))
