"""Calibration of simulator profiles: measure step times on a GPU (`gpu`), or fit them to SGLang's
own benchmark results (`fit`)."""
