"""A TF1 model written with tf.contrib, checked as it ran in TensorFlow 1.15 against its TF2 rewrite
(``equivtool demo --tf1-python PATH``; see docs/tf1-as-it-ran.md)."""
