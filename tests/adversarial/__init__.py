"""Adversarial candidate engines: copies of engine_template written as a speed-hungry hostile agent would write
them (see candidates.py; the code each one adds to its engine lives in payloads/)."""
