"""The lab: the demo, `callgate chaos` and `callgate bench`. The product never imports it."""
