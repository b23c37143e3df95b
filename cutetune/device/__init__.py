"""The device model: device specs and ceilings, the roofline and its funnel, timing and
verification. Nothing here searches; the tuner, the bench and the report all read it."""
