"""What holds at x*: Jacobian operators, spectra, Props. 4-5, App. A.8, reachability, accuracy, reports."""
