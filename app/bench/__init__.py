"""`tandem-cli bench`: Tandem's decoding side by side with the target alone and the anchors."""
