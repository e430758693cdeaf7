"""The hub: channels (one upstream monitor each), views (one per subscription), the tick."""
