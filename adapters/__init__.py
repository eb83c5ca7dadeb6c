"""Provider adapters: one small interface (base.Adapter), one module per provider."""
