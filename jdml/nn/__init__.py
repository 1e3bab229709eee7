"""Small neural-network building blocks shared by the methods (e.g. gradient reversal)."""
