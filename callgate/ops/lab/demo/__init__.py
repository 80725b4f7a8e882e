"""Demo tools and the two demo downstream providers (payments, mail)."""
