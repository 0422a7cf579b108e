"""The theory (stability/theory): the symbolic derivations, Figure 5's regions, the verifiers."""
