"""How a serving process is put together from its one config, above the parts it joins: the cascade as
`tandem serve` and the Android bridge start it (sdk.assembly.cascade). Every part is made before what
uses it and handed to it at construction; nothing here reaches into a part after it is made."""
