"""The classic Keras MNIST convnet: TF1 graph (tf1_model) and TF2 shim layer (keras_model)."""
