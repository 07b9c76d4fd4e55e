"""The live replay: a trace through the running services at accelerated time, and its efficiency report."""
