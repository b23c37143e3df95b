"""cutetune inside other libraries' models: each integration finds the modules cutetune's ops
serve and installs forwards that call them. A layer above the ops; cutetune imports none of
these, so the libraries they patch stay optional."""
