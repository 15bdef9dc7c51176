"""Expected-state store on Delta tables (delta-rs): what every sink must hold after each epoch."""
