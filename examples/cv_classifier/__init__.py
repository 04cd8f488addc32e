"""The image classifier that examples/cv_example.py trains (that script is the manual and the
entry point); one concern per module. Importing the package imports nothing heavy."""
